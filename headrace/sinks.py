"""Every sink connector, by name: ``hr.sinks.Console()``, ``hr.sinks.Postgres(...)``."""

from headrace.connectors.console import Console
from headrace.connectors.delta import Delta
from headrace.connectors.failover import Failover
from headrace.connectors.files_sink import FileSink as Files
from headrace.connectors.kafka_sink import Kafka
from headrace.connectors.mqtt import MqttSink as Mqtt
from headrace.connectors.nats_jetstream import NatsSink as Nats
from headrace.connectors.null_sink import Null
from headrace.connectors.postgres import Postgres
from headrace.connectors.rabbitmq_streams import RabbitMQSink as RabbitMQ
from headrace.connectors.redis_sink import Redis
from headrace.connectors.scripted import TestSink

__all__ = ["Console", "Delta", "Failover", "Files", "Kafka", "Mqtt", "Nats", "Null", "Postgres", "RabbitMQ", "Redis",
           "TestSink"]
