"""RabbitMQ: topology names, declaration, connections, publishing and consuming. Only
jobcore imports aio-pika.

- :mod:`.topology`: exchange and queue names, and their idempotent declaration;
- :mod:`.connection`: opening connections with settings applied and errors translated;
- :mod:`.publisher`: confirmed, pipelined publishing over one connection;
- :mod:`.deliveries`: consuming job queues, and the deliveries the worker settles;
- :mod:`.consuming`: the loop every queue consumer shares (start, a task per delivery,
  stop, drain);
- :mod:`.deadletters`: the dead-letter queue: look without losing anything, replay.
"""
