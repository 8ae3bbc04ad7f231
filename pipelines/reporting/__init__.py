"""What rows become: figures declared once (`figures`) as mergeable partial sums (`aggregates`),
their intervals (`uncertainty`), the safety card's figures (`card_figures`), release gates on them
(`gates`) and the HTML/Markdown report page (`report`). It imports neither the data plane nor a
pipeline."""

# the modules other packages may import (a test holds every import from outside to this list)
__all__ = ["aggregates", "card_figures", "figures", "gates", "report", "uncertainty"]
