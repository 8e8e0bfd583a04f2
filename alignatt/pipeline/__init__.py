"""The DVC machinery: params, the stage container wrapper, and the doctor."""
