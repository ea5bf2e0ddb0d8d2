"""``python -m schemas [PATH]``: regenerate the committed JSON Schema export."""

from schemas.jsonschema import main

raise SystemExit(main())
