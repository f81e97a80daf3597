"""The API's surfaces: the HF and raw bodies, the Open Inference Protocol, the probes, /info, OpenAPI."""
