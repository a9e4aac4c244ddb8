"""Machine learning in the stream: a model registry (``publish``) that a pipeline's ``score``
step reads, taking a newly published version in its next micro-batch (docs/ml.md)."""

from headrace.ml.registry import Manifest, latest_version, load_model, manifest, publish, versions

__all__ = ["Manifest", "latest_version", "load_model", "manifest", "publish", "versions"]
