"""Alignment head sets: the JSON format, the shipped sets, and calibration on word-aligned pairs."""
