"""Every source connector, by name: ``hr.sources.Generator(...)``, ``hr.sources.Files(...)``."""

from headrace.connectors.delta import DeltaSource as Delta
from headrace.connectors.files_source import FileSource as Files
from headrace.connectors.generator import Generator, ysb_ads
from headrace.connectors.kafka_source import Kafka
from headrace.connectors.mqtt import Mqtt
from headrace.connectors.nats_jetstream import Nats
from headrace.connectors.postgres_cdc import PostgresChanges
from headrace.connectors.rabbitmq_streams import RabbitMQ
from headrace.connectors.redis_streams import Redis
from headrace.connectors.scripted import TestSource
from headrace.connectors.socket import Socket

__all__ = ["Delta", "Files", "Generator", "Kafka", "Mqtt", "Nats", "PostgresChanges", "RabbitMQ", "Redis", "Socket",
           "TestSource", "ysb_ads"]
