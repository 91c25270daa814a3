"""What every rank of a group must pass alike: the arguments read for each record
(:mod:`.arguments`) and the running fingerprint each group folds them into
(:mod:`.fingerprint`)."""
