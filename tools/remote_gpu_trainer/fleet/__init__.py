"""Fleet pre-flight: check every node of a multi-node run at once, then prove the collective works.

hosts.py parses the fleet (host list, hostfile, Slurm nodelist); facts.py gathers one box's facts
(an internal remote spec); verdicts.py judges across hosts; allreduce.py runs the collective
benchmark; tool.py is the ``preflight`` tool that ties them together.
"""
