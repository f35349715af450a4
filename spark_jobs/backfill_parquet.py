"""spark-submit entry: a topic's history to Parquet, partitioned by partition and date.

    spark-submit spark_jobs/backfill_parquet.py --topic /default/orders --output out/ \
        --config danube.yml [--start-offset N] [--end-offset N] [--mode overwrite]

The options are `danube backfill parquet --help`'s (docs/spark.md); spark-submit's own
(--master, --conf ...) go before the script.
"""

from danube.cli.backfill import main

if __name__ == "__main__":
    main("parquet")
