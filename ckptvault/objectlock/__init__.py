"""S3 Object Lock on the saves ckptvault keeps (docs/object-lock.md): the retention a save gets, its
legal hold, a drill's check that neither was weakened since, and the enforcement probe's memory."""
