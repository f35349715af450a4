"""Namespaces and topics in etcd, their growth, and the topic lists of many-topics streams."""
