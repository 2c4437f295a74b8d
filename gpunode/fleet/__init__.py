"""Fleet operations: what gpunode does to nodes as a fleet, beyond converging them.

``remedies.py``: health remedies gpunode carries out itself (``gpunode drift --remedy``).
The rollout (``gpunode/rollout.py``) and the scheduler (``gpunode/scheduler.py``) are fleet
operations too and belong here; they stay where they are until a change of their own moves
them.
"""
