"""Messages across protocols: Avro (schema ids, single-object encoding, the bounds checked
before fastavro reads, records as JSON), a message as JSON clients see it (``jsonview.py``),
a frontend's own headers, AMQP header values through the core (``tagged.py``) and how deep
decoded data nests (``nesting.py``). Sans-IO; it imports nothing of polymq_server, and
everything else may import it."""
