"""Named fully connected networks (sources in the README).

``das2016-dnn``: the 7-layer speech DNN of Das et al. 2016 (arXiv 1602.06709), which the
paper scales to 16 nodes.  Its shape is that of the network the paper's DNN comes from,
the CD-DNN-HMM acoustic model of Seide, Li and Yu (Interspeech 2011) on Switchboard:
11 frames of 39 PLP features in (429), 7 hidden layers of 2048 sigmoid units, 9304
tied triphone states (senones) out; fp32, as the paper trains it.
"""

from __future__ import annotations

from types import MappingProxyType

from .model import MLPConfig

MLPS = MappingProxyType({
    "das2016-dnn": MLPConfig(name="das2016-dnn", inputs=11 * 39, hidden=2048, layers=7, classes=9304,
                             activation="sigmoid", dtype="fp32"),
})
