"""TensorFlow: graph and eager objects, runs, stopping, health and explanations."""
