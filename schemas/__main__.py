"""``python -m ackline.schemas [PATH]``: regenerate the committed JSON Schema export."""

from ackline.schemas.jsonschema import main

raise SystemExit(main())
