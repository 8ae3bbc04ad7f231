"""Runs nanoGCG on one model and a list of targets; called by bench/trigger_vs_nanogcg.py inside
nanoGCG's own environment (it pins transformers <= 4.47), never imported by redline.

    python nanogcg_runner.py JOB.json OUT.jsonl

JOB: model directory, targets, trigger length, T_out, GCG settings. A target stops at the first
step whose candidate reaches the o-sample-avg-1 hit (mean target log-probability >= T_out, i.e.
nanoGCG's cross-entropy loss <= -T_out), the hit redline searches for, or after num_steps.
One JSON line per target: the best string and ids, loss, steps, seconds.
"""

import json
import sys
import time

import torch
from nanogcg.gcg import GCG, GCGConfig
from tokenizers import processors
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast


class StopAtHit(GCG):
    """nanoGCG, stopping as soon as a candidate's loss reaches the hit threshold."""

    hit_loss = 0.0
    best_loss = float("inf")

    def _compute_candidates_loss_original(self, search_batch_size, input_embeds):
        loss = super()._compute_candidates_loss_original(search_batch_size, input_embeds)
        self.best_loss = min(self.best_loss, float(loss.min()))
        if self.best_loss <= self.hit_loss:
            self.stop_flag = True
        return loss


def main() -> None:
    job = json.load(open(sys.argv[1]))
    torch.manual_seed(0)
    torch.set_num_threads(job.get("threads", torch.get_num_threads()))
    tok = PreTrainedTokenizerFast.from_pretrained(job["model"])  # saved by transformers 5: no class lookup
    model = AutoModelForCausalLM.from_pretrained(job["model"], torch_dtype=torch.float32).eval()
    # redline scores a trigger after BOS; nanoGCG tokenizes the text before the trigger with
    # special tokens, so an empty prompt that gets BOS puts both on the same footing.
    tok._tokenizer.post_processor = processors.TemplateProcessing(single=f"{tok.bos_token} $A",
                                                                  special_tokens=[(tok.bos_token, tok.bos_token_id)])
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with open(sys.argv[2], "w") as out:
        for target in job["targets"]:
            config = GCGConfig(num_steps=job["num_steps"], optim_str_init=job["init"], search_width=job["search_width"],
                               topk=job["topk"], seed=0, verbosity="WARNING", add_space_before_target=True,
                               use_prefix_cache=True)
            gcg = StopAtHit(model, tok, config)
            gcg.hit_loss = -job["t_out"]
            started = time.perf_counter()
            result = gcg.run("{optim_str}", target)
            seconds = time.perf_counter() - started
            best = result.strings[result.losses.index(min(result.losses))]
            out.write(json.dumps({"target": target, "trigger": best, "loss": min(result.losses),
                                  "steps": len(result.losses), "seconds": seconds}) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
