"""The eval harness behind ``evals/run_evals.py``: stdlib only, so it runs in CI and in hooks with a
plain ``python3`` and no install. Optional extras (sentence embeddings, an agent CLI, an LLM judge)
are imported or started only when their mode is asked for.

Modules, in the order data flows through them:

- :mod:`.text`      normalisation, clauses and the negation rule every matcher shares;
- :mod:`.schema`    reading and validating ``cases.jsonl`` / answers / calibration lines;
- :mod:`.scoring`   rubric matchers, forbid rules and the case score;
- :mod:`.markdown`  a small reader for the skill's markdown (entry IDs, anchors, links);
- :mod:`.structure` the default CI mode: refs, cites, links, lints, calibration;
- :mod:`.report`    summary statistics and the JSON / Markdown / JUnit reports;
- :mod:`.agents`    running an agent or judge CLI without a shell, and reading its output;
- :mod:`.judge`     the optional LLM judge with verbatim-evidence checks;
- :mod:`.semantic`  the optional embedding fallback (half credit at most);
- :mod:`.facts`     catalog strings, commands and version claims against the real packages;
- :mod:`.scenarios` each cpu entry's Verify run on its failure and its fix, in shared torch workers;
- :mod:`.verify`    the verify command: scenarios, figures recomputed by the tools, what Verify steps need;
- :mod:`.cli`       argument parsing for the commands.
"""

HARNESS_VERSION = "1.0"
