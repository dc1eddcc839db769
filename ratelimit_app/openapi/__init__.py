"""OpenAPI schemas that show the limits: a drf-spectacular postprocessing hook
(``openapi.spectacular``) and a NinjaAPI mixin (``openapi.ninja``), both writing what
``openapi.limits`` works out for an operation."""
