"""Publishing a trained model to the Hugging Face Hub or an fsspec object store.

What is pushed: the final model, tokenizer, config, results and the model card of a run
directory (the card is regenerated first from the run's config and ``all_results.json``), or
every file of a model directory. ``checkpoint-*`` folders only on request (whole, so that
they can be resumed). Of a checkpoint pushed on its own, only the model files: its training
state (optimizer, scheduler, RNG states, trainer state) only with ``include_optimizer``. A
model whose files do not match the manifest of its save is refused, and a
``training_args.bin`` holding a secret is never uploaded.

Hub: one commit for the whole upload through ``huggingface_hub`` (the repository and the
branch are created when missing).

Object stores: publication is atomic for readers. Files are uploaded under a staging prefix
beside the destination (``<parent>/.<name>.lmctl-staging/``) and each object's size and
checksum are verified; only then are they moved into the destination, and a manifest
(``lmctl-manifest.json``: every file with its size and SHA-256) is written last. A reader
that finds the manifest finds every file it lists. An interrupted push is re-run with the
same command: objects already verified in staging (or already in place) are not uploaded
again.

The files of a push (:mod:`~lmctl.publish.files`), the Hub (:mod:`~lmctl.publish.hub`),
object stores (:mod:`~lmctl.publish.stores`), and ``lmctl push`` and ``--push-to`` with the
destination they name (:mod:`~lmctl.publish.push`).
"""
