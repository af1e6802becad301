"""Model card (README.md + plots) for a drafter folder, generated from ``dsparkhub verify`` results files only.

The package owns the card: :mod:`~dsparkhub.card.facts` (the files a card's numbers come from, and the refusals that
keep a card honest: results of another drafter or of a run that was not lossless are refused),
:mod:`~dsparkhub.card.tables` (formatting, serve commands, sections, Hub metadata), :mod:`~dsparkhub.card.plots`
(matplotlib), :mod:`~dsparkhub.card.engines` (SGLang launch, engine checks) and :mod:`~dsparkhub.card.render`
(template context, rendering, atomic write).

It does not measure (``dsparkhub.verify``) or upload (``dsparkhub.hub.push``).
"""

#: The last line of a README.md that ``dsparkhub card`` wrote: ``card`` replaces such a file, ``push`` may delete it.
#: A constant of the package itself (no imports), so that ``dsparkhub.hub`` can read it without importing the renderer.
CARD_MARKER = "<!-- written by `dsparkhub card`: running it again replaces this file -->"
