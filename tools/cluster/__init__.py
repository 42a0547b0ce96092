"""The test cluster: two hosts as network, UTS, mount and PID namespaces on this machine (root), with
sshd, DeepSpeed's hostfile runner and Slurm across them; ``make test-cluster`` and the rehearsal use it.

A developer tool, not installed with ``plsh_dist``; ``results/cluster/README.md`` says what it checks.
"""
