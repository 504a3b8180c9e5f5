"""Publishing a trained model to the Hugging Face Hub or an fsspec object store: what is pushed
(:mod:`~lmctl.publish.files`), the Hub (:mod:`~lmctl.publish.hub`), object stores
(:mod:`~lmctl.publish.stores`), and ``lmctl push`` and ``--push-to`` (:mod:`~lmctl.publish.push`).
"""
