"""One data module per engine: its profile (``accounting.engine_profile.EngineProfile``), each number sourced."""
