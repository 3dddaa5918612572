"""polymq's STOMP 1.0-1.2 frontend, over TCP and WebSocket."""
