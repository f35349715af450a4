"""The error codes of the client API (HTTP and Danube's gRPC; docs/http-api.md, "Errors")
that more than one place writes: the servers that raise them and the SDK that branches on
them use these names, so a code is spelled once. A code only one class raises stays that
class's ``code``; the kind of each (what status it is answered with) is the raiser's
(danube.errors.ErrorKind)."""

from __future__ import annotations

# One message's payload over its limit: the topic's policy, ingest's cap, the SDK's own.
PAYLOAD_TOO_LARGE = "payload_too_large"
TOPIC_NOT_FOUND = "topic_not_found"
NAMESPACE_NOT_FOUND = "namespace_not_found"
# A consumer that is not attached: the SDK attaches again on it.
CONSUMER_NOT_FOUND = "consumer_not_found"
SUBSCRIPTION_NOT_FOUND = "subscription_not_found"
# An exclusive subscription that has its consumer: the SDK's re-attach waits on it.
SUBSCRIPTION_TAKEN = "subscription_taken"
# An idempotent producer's refusals by the partition's leader (danube.wire.ingest).
OUT_OF_ORDER_SEQUENCE = "out_of_order_sequence"
PRODUCER_FENCED = "producer_fenced"
