"""The product image built without Docker, from `Dockerfile` itself (`make image`)."""
