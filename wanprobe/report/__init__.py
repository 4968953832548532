"""The versioned diagnose report: schema, document model, renderers and a directory listing."""
