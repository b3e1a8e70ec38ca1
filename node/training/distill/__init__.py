"""Distil a small draft for the real target (SmolLM2-135M-Instruct) on this machine.

Three resumable stages, each keeping its state in ``work_dir`` (``specmarket train-draft --help``):

1. **labels**: the target scores sequences and its top-k next-token log-probabilities are kept
   (knowledge distillation, Hinton, Vinyals & Dean 2015; truncated to the top k, which hold nearly
   all of the mass, to keep the labels small). Sources: the target's own answers to the teacher prompts
   (``node.training.teacher``; loss on the answer tokens) and raw standard-library code
   (files of the corpus's training split that no held-out prompt was made from).
2. **train**: the draft (``node.model.subvocab``: the target's embedding, a few of its decoder layers as
   the starting point, a frequency-ranked sub-vocabulary head) minimises the cross-entropy to the
   target's top-k distribution renormalised over the sub-vocabulary. Checkpoints are atomic, so an
   interrupted run resumes at its last checkpoint.
3. **ship**: evaluation on the held-out teacher answers (prompts never trained on, chat and code):
   greedy acceptance (draft argmax == target argmax, teacher-forced) and the Gumbel-coupled match
   rate at T = 0.8 with the project's own noise (``verifier.noise``); then the draft directory and
   its manifest are written.

The stages are ``labels.label``, ``train.train`` and ``ship.ship``, each taking a ``DistillConfig``
(``config``: every default of `specmarket train-draft`).
"""

from verifier.exports import lazy_exports

EXPORTS = {
    "node.training.distill.config": ("STAGES", "DistillConfig"),
    "node.training.distill.labels": ("DistillError", "frequency_ranked_ids", "label", "load_labels"),
}
__getattr__, __all__ = lazy_exports(__name__, EXPORTS)
