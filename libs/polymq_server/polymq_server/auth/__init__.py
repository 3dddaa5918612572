"""Who a client is and what it may do: the one interface every frontend and the core use
(``provider.py``, ``python -m polymq_server.auth.provider``), principals and grants, passwords and
tokens, the users file, logins held back per address, and whose permission a declaration's
dead letters ride on (``deadletter.py``). It may import the top-level ``names`` and ``config``;
``link``, ``web`` and the top-level ``reload`` build on it."""
