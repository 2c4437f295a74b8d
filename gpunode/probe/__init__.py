"""GPU node hardware probe (node side) and the parsers of vendor-tool output (control side).

- ``gpu_probe``: a self-contained program (stdlib, optional pynvml) that a fact pipes to the
  node's ``python3``; it prints one JSON document about the node's GPUs and driver stack.
- ``parsers``: pure functions turning the output of ``nvidia-smi``, ``ibstat``, ``nvme``,
  the kernel log and syslog into data or an explicit "unreadable" result; plus the shell
  commands of each section (``SECTION_COMMANDS``) and ``parse_section``.
"""
