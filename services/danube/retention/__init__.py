"""The retention service: what may leave the WAL (uploaded and past the policy) and what may
leave object storage (the topic's cloud retention). One leader does the work."""
