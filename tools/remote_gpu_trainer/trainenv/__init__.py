"""The user's training environment on a machine: which python the job runs with, what its torch stack is, and
the environment a launch there sees.

A box's ``python3`` is rarely the training interpreter: the user's torch lives in a venv (``~/venvs/pt``), a
conda env, ``~/.local`` or the image's own python, and the skill's runtime has a private venv of its own. Every
tool that looks at the training stack therefore takes the job's environment (``python=`` or ``activate=``),
finds it when not given, and says which interpreter it checked and how it was found.

* ``find.py``: the order of the search and the :class:`~.find.TrainingEnv` every such tool reports;
* ``probe.py``: the version probe, a standard-library script the training interpreter runs in a child process,
  one reading per step so a partial reading survives (torch imports, ``torch.distributed`` fails);
* ``launch.py``: the environment a launch gets (a login shell's ``NCCL_*``, ``GLOO_*``, ``CUDA_VISIBLE_DEVICES``,
  ``MASTER_*``, NCCL's own config files, a launch script's exports and endpoint) and the checks against the node;
* ``child.py``: how our torch-side modules (repro worker, measured memory, all-reduce ranks) run under that
  interpreter, which sees only the standard library, its own packages and our package.
"""
