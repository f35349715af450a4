"""spark-submit entry: a topic's history produced into a topic through the HTTP API, in
checkpointed batches, safe to re-run.

    spark-submit spark_jobs/backfill_topic.py --topic /default/orders --to /default/replay \
        --service-addr http://discovery:8080 --config danube.yml

The options are `danube backfill topic --help`'s (docs/spark.md); spark-submit's own
(--master, --conf ...) go before the script.
"""

from danube.cli.backfill import main

if __name__ == "__main__":
    main("topic")
