"""Cases where the DUT is the requester and the tester responds (IBTA Vol. 1 §9.7.5.2, §9.9.3)."""
