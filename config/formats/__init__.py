"""Django's formats for the service's one language: times print as ``kinds.formatting.timestamp`` prints them."""
