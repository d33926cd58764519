"""Periodic maintenance: every service that keeps the database healthy, with its library
half, run by one leader per database (:mod:`jobcore.maintenance.maintainer`)."""
