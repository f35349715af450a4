"""The dispatcher: subscriptions, cursors, acks, redelivery; exclusive/shared/failover delivery."""
