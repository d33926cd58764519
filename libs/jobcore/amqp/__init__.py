"""RabbitMQ: topology names, declaration, and connections. Only jobcore imports aio-pika."""
