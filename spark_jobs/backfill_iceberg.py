"""spark-submit entry: keep an Iceberg table in step with a topic (docs/spark.md, "Iceberg table").

    spark-submit spark_jobs/backfill_iceberg.py --topic /default/orders \
        --table danube.orders --etcd etcd-1:2379 [--warehouse DIR | --catalog-property K=V ...]

The options are `danube backfill iceberg --help`'s; spark-submit's own (--master, --conf ...)
go before the script.
"""

from danube.cli.backfill import main

if __name__ == "__main__":
    main("iceberg")
