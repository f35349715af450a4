"""What every service process runs: its session (bus, etcd, node lease, registration:
:mod:`.service`), its health server, listeners and their limits, logs, loop-lag watch and
slots.

How ``danube up`` starts and supervises the mesh is :mod:`danube.up`.
"""
