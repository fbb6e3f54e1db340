"""Benchmarking polykit's engine (trtexec's role): latency, throughput and compute time of a plan
(benchmark) and of a model split over ranks (ranks)."""
