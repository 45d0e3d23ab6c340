"""What the diagnosis speaks in, apart from the engine that derives it: the states each second of a GPU's time is
split into (``states``), the thresholds the verdict rules compare a window with (``thresholds``), and what the
analyzer gives after a poll (``result``: InsightResult and its parts; ``verdicts``: Diagnosis and Evidence). These
modules import nothing of the engine (gpuwarden.insight's other modules); the documents served over HTTP are
gpuwarden.web.diagnosis and gpuwarden.web.idleness.
"""
