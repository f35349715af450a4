"""The consume protocol of the HTTP doors (docs/http-api.md, "Consume"): what discovery's
proxy routes and a dispatcher's consume door (DESIGN §10) answer alike.

- :mod:`.models`: the JSON bodies (ack and nack requests, stream frames, polled messages);
- :mod:`.ids`: the public consumer id, ``<ns>.<topic>.<sub>.<dispatcher consumer id>``;
- :mod:`.messages`: polled messages to their public form, ack bodies to runs of offsets,
  and :class:`~.messages.ConsumerCalls`, the operations a door asks of the subscription's
  dispatcher (over the bus: ``DispatcherClient``; in its own process: the consume door);
- :mod:`.stream_protocol` and :mod:`.stream`: the WebSocket stream with credits.
"""
