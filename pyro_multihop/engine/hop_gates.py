"""Deprecated module path: what a head hands the engine is now :mod:`.hop_factors` (``HopGates`` was renamed
:class:`~.hop_factors.HopFactors`: it carries the emission as well as the gates), and the route choice is
:mod:`.routes`. Every name read here warns (:class:`DeprecationWarning`, naming its new home) and returns the new
object; this module goes in the next release."""

from .moved_names import deprecated_aliases

__all__: list = []

_HOP_FACTORS = "pyro_multihop.engine.hop_factors"
_ROUTES = "pyro_multihop.engine.routes"
__getattr__ = deprecated_aliases(__name__, {
    "HopGates": (_HOP_FACTORS, "HopFactors"),
    "HopFactors": (_HOP_FACTORS, "HopFactors"),
    "chain_from_scores": (_HOP_FACTORS, "chain_from_scores"),
    "first_hop_log_probs": (_HOP_FACTORS, "first_hop_log_probs"),
    "ROUTES": (_ROUTES, "ROUTES"),
    "SYMBOL_ROUTE_RATIO": (_ROUTES, "SYMBOL_ROUTE_RATIO"),
    "choose_route": (_ROUTES, "choose_route"),
})
