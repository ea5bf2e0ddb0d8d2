"""The PostgreSQL side: migrations, offsets and fencing, and the batch writer."""
