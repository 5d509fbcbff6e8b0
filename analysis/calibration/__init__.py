"""Planning and calibration: how precise a design will be (`precision`), planted-truth studies (`simulate`) and
pre-registered forecasts (`forecast`)."""
