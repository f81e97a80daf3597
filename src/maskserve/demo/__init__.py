"""The demo page's forms, answered through the same path as the API, rendered without JavaScript."""
