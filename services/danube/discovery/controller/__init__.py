"""The cluster controller: assignment, balancing, moves and drains (docs/controller.md)."""
