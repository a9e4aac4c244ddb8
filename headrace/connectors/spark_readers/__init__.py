"""The pyspark data sources that read for headrace's own sources, one module each. A source names
its class (``SourceConnector.spark_data_source``), and the module is imported only when a query
starts: building a plan never loads pyspark."""
