"""Every source connector, by name: ``hr.sources.Generator(...)``, ``hr.sources.Files(...)``.

Each loads on first use, so a plan imports the connectors it names, not all of them with their
client libraries; ``CONNECTORS`` is the one list (pipeline files read it too)."""

from typing import TYPE_CHECKING

from headrace.lazy_modules import lazy_attributes

CONNECTORS = {
    "Delta": "headrace.connectors.delta:DeltaSource",
    "Files": "headrace.connectors.files_source:FileSource",
    "Generator": "headrace.connectors.generator:Generator",
    "Kafka": "headrace.connectors.kafka_source:Kafka",
    "Mqtt": "headrace.connectors.mqtt:Mqtt",
    "Nats": "headrace.connectors.nats_jetstream:Nats",
    "PostgresChanges": "headrace.connectors.postgres_cdc:PostgresChanges",
    "RabbitMQ": "headrace.connectors.rabbitmq_streams:RabbitMQ",
    "Redis": "headrace.connectors.redis_streams:Redis",
    "Socket": "headrace.connectors.socket:Socket",
    "TestSource": "headrace.connectors.scripted:TestSource",
}
__all__ = [*CONNECTORS, "ysb_ads"]
__getattr__ = lazy_attributes(__name__, {**CONNECTORS, "ysb_ads": "headrace.connectors.generator:ysb_ads"})

if TYPE_CHECKING:  # the same names, for type checkers
    from headrace.connectors.generator import ysb_ads
