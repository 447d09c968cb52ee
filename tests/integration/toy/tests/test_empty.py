"""No tests here."""
