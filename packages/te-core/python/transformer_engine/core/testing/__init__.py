"""What the test suites of te-core, te-pytorch and te-jax share: the random
seed (seeds), the unit roundoffs their error bounds are built from
(tolerances) and the input shapes (shapes). NumPy only: no framework import,
so every package's tests can use it."""
