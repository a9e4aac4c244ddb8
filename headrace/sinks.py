"""Every sink connector, by name: ``hr.sinks.Console()``, ``hr.sinks.Postgres(...)``.

Each loads on first use, so a plan imports the connectors it names, not all of them with their
client libraries; ``CONNECTORS`` is the one list (pipeline files read it too)."""

from typing import TYPE_CHECKING

from headrace.lazy_modules import lazy_attributes

CONNECTORS = {
    "Console": "headrace.connectors.console:Console",
    "Delta": "headrace.connectors.delta:Delta",
    "Failover": "headrace.connectors.failover:Failover",
    "Files": "headrace.connectors.files_sink:FileSink",
    "Kafka": "headrace.connectors.kafka_sink:Kafka",
    "Mqtt": "headrace.connectors.mqtt:MqttSink",
    "Nats": "headrace.connectors.nats_jetstream:NatsSink",
    "Null": "headrace.connectors.null_sink:Null",
    "Postgres": "headrace.connectors.postgres:Postgres",
    "RabbitMQ": "headrace.connectors.rabbitmq_streams:RabbitMQSink",
    "Redis": "headrace.connectors.redis_sink:Redis",
    "TestSink": "headrace.connectors.scripted:TestSink",
    "View": "headrace.connectors.view_sink:View",
}
__all__ = list(CONNECTORS)
__getattr__ = lazy_attributes(__name__, CONNECTORS)

if TYPE_CHECKING:  # the same names, for type checkers
    pass
