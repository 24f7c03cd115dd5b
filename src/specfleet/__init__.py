"""specfleet: EAGLE-3 speculative decoding on vLLM, from bare OS to a fleet."""

__version__ = "0.1.0"
